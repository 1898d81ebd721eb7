"""vllm_replayssm.models: the fail-closed layer check. With replayssm enabled, a model whose
SSM layers are vLLM's stock ones (our out-of-tree registration missing, e.g. replaced by
another plugin) refuses to build instead of silently running stock; with replayssm off the
same model builds. The real model classes on the tiny checkpoints, in a fresh process (it
initialises a one-rank process group)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, socket, sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from tests.models.tiny import build_checkpoint


def main():
    import vllm_replayssm
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.custom_op import op_registry_oot

    vllm_replayssm.register()
    from vllm_replayssm import models

    classes = {"qwen3_next": models.ReplayQwen3NextForCausalLM,
               "nemotron_h": models.ReplayNemotronHForCausalLM}
    paths = {kind: build_checkpoint(kind, Path(sys.argv[2]) / kind) for kind in classes}

    def config(kind, enabled):
        return EngineArgs(model=str(paths[kind]), skip_tokenizer_init=True, dtype="bfloat16",
                          enforce_eager=True, max_model_len=256,
                          additional_config={"replayssm": {"enabled": enabled}}
                          ).create_engine_config()

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with set_current_vllm_config(config("qwen3_next", False)):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)

    def build(kind, enabled):
        cls = classes[kind]
        vllm_config = config(kind, enabled)  # fresh: layer names are registered per config
        with set_current_vllm_config(vllm_config):
            try:
                model = cls(vllm_config=vllm_config, prefix="")
            except RuntimeError as exc:
                return {"refused": str(exc)}
        return {"ours": sum(isinstance(m, cls._replay_layer) for m in model.modules()),
                "stock": sum(isinstance(m, cls._stock_layer)
                             and not isinstance(m, cls._replay_layer)
                             for m in model.modules())}

    result = {}
    for kind, cls in classes.items():
        result[kind] = {"registered": build(kind, True)}
        op_registry_oot.pop(cls._stock_layer.__name__)  # our layer is no longer swapped in
        result[kind]["unregistered"] = build(kind, True)
        result[kind]["unregistered_off"] = build(kind, False)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
"""


def test_stock_layers_are_refused_when_replayssm_is_enabled(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run(
        [sys.executable, str(script), str(REPO), str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    layer = {"qwen3_next": "QwenGatedDeltaNetAttention", "nemotron_h": "MambaMixer2"}
    for kind, runs in result.items():
        assert runs["registered"] == {"ours": 3, "stock": 0}, (kind, runs)
        refused = runs["unregistered"].get("refused", "")
        assert f"are stock {layer[kind]}" in refused, (kind, runs)
        assert runs["unregistered_off"] == {"ours": 0, "stock": 3}, (kind, runs)
