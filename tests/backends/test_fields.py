"""backends/fields.py: our metadata made from vLLM's without going through `__init__` holds
the same attributes as one that did, with our fields' defaults where none is given."""

import dataclasses

import pytest
import torch

from vllm_replayssm.backends.fields import extend_metadata


@dataclasses.dataclass
class Base:
    a: int
    b: torch.Tensor | None
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self):
        self.derived = self.a * 10


@dataclasses.dataclass
class Ours(Base):
    x: int | None = None
    y: str = "default"


def test_extend_takes_every_attribute_as_it_is_and_our_defaults():
    t = torch.zeros(3)
    md = Base(a=4, b=t)
    ours = extend_metadata(Ours, md, x=7)
    assert type(ours) is Ours
    assert ours.a == 4 and ours.b is t and ours.derived == 40  # post-init state, not rerun
    assert (ours.x, ours.y) == (7, "default")
    built = Ours(a=4, b=t, x=7)
    assert all(
        getattr(ours, f.name) is getattr(built, f.name)
        or getattr(ours, f.name) == getattr(built, f.name)
        for f in dataclasses.fields(Ours)
    )
    view = dataclasses.replace(ours, a=5)  # a layer's view keeps our fields
    assert type(view) is Ours and (view.x, view.y) == (7, "default")


def test_extend_refuses_unknown_fields_and_unrelated_classes():
    md = Base(a=1, b=None)
    with pytest.raises(TypeError, match="adds no fields"):
        extend_metadata(Ours, md, z=1)
    with pytest.raises(TypeError, match="adds no fields"):
        extend_metadata(Ours, md, a=2)  # a stock field is vLLM's to set

    @dataclasses.dataclass
    class Other:
        a: int = 0

    with pytest.raises(TypeError, match="does not extend"):
        extend_metadata(Ours, Other())
