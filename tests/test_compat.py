"""The vLLM release gate."""

import pytest

from vllm_replayssm.compat import (
    ALLOW_UNPINNED_ENV,
    PINNED_VLLM,
    UnsupportedVLLMError,
    check_vllm_version,
)


def test_installed_vllm_is_the_pinned_release():
    assert check_vllm_version() == PINNED_VLLM


@pytest.mark.parametrize("version", ["0.26.0", "0.26.0+cpu", "0.26.0+cu130"])
def test_local_suffixes_are_ignored(version):
    assert check_vllm_version(version) == "0.26.0"


def test_other_releases_are_refused(monkeypatch):
    monkeypatch.delenv(ALLOW_UNPINNED_ENV, raising=False)
    with pytest.raises(UnsupportedVLLMError, match=r"supports vLLM 0\.26\.0 only; found 0\.27\.1"):
        check_vllm_version("0.27.1")
    monkeypatch.setenv(ALLOW_UNPINNED_ENV, "1")
    assert check_vllm_version("0.27.1") == "0.27.1"
