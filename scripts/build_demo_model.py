#!/usr/bin/env python3
"""Rebuild the embedded demo models in vllm_replayssm/demo/ (deterministic: same files byte
for byte with the pinned torch / transformers / tokenizers).

    .venv/bin/python scripts/build_demo_model.py            # both demos, in place
    .venv/bin/python scripts/build_demo_model.py --check    # rebuild elsewhere and compare
    .venv/bin/python scripts/build_demo_model.py qwen3_next --out /tmp/demos

The logic is `vllm_replayssm.demo.build` (also `python -m vllm_replayssm.demo.build`).
"""

import sys

from vllm_replayssm.demo.build import main

if __name__ == "__main__":
    sys.exit(main())
