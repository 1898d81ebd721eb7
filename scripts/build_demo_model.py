#!/usr/bin/env python3
"""Retrain the embedded demo models in vllm_replayssm/demo/ (fixed seed, CPU; the same
machine, thread count and pinned torch / transformers / tokenizers give the same files byte
for byte), or check the shipped ones.

    .venv/bin/python scripts/build_demo_model.py            # train both demos, in place
    .venv/bin/python scripts/build_demo_model.py --check    # verify the shipped files
    .venv/bin/python scripts/build_demo_model.py --check --retrain   # and retrain to compare
    .venv/bin/python scripts/build_demo_model.py qwen3_next --out /tmp/demos

The logic is `vllm_replayssm.demo.build` (also `python -m vllm_replayssm.demo.build`).
"""

import sys

from vllm_replayssm.demo.build import main

if __name__ == "__main__":
    sys.exit(main())
