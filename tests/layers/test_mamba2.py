"""layers/mamba2.py: pieces of the Mamba-2 layer that stand alone (the engine tests,
tests/plugin/, run the layer itself)."""

from vllm_replayssm.layers.mamba2 import last_of_stack


def test_last_of_stack_compares_layer_numbers_within_one_stack():
    """NemotronH's Mamba-2 layers at 0, 2, 10 and 12 (numbers, not text: "2" < "10"), a
    drafter's stack beside them and a prefix without a number."""
    target = [f"model.layers.{i}.mixer" for i in (0, 2, 10, 12)]
    drafter = ["model.mtp.layers.40.mixer", "model.mtp.layers.41.mixer"]
    names = target + drafter + ["mixer"]
    assert [last_of_stack(n, names) for n in target] == [False, False, False, True]
    assert [last_of_stack(n, names) for n in drafter] == [False, True]
    assert last_of_stack("mixer", names)
    assert last_of_stack("model.layers.2.mixer", ["model.layers.2.mixer"])
