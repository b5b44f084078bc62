"""A real model end to end (examples/nanoguard_fp8.py): NanoGuard's trained weights, shipped in
its PyPI package, with every block linear on BlockFP8Linear and its RMSNorm on our kernels,
against the bf16 model. Needs a GPU and `pip install -e .[model]`."""
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def test_nanoguard_on_block_fp8_agrees_with_bf16():
    pytest.importorskip("nanoguard", reason="pip install -e .[model] (metatronnanoguard)")
    pytest.importorskip("tiktoken", reason="pip install -e .[model] (tiktoken)")
    spec = importlib.util.spec_from_file_location("nanoguard_fp8",
                                                  ROOT / "examples" / "nanoguard_fp8.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    r = example.run()
    print(r, file=sys.stderr)
    assert r["converted"] == 24
    for mode in ("eager", "compiled"):
        a = r[mode]
        assert a["top1"] == 1.0 and a["cos_mean"] > 0.995 and a["cos_min"] > 0.98, (mode, a)
        assert a["max_dp"] < 0.05, (mode, a)
    assert r["graph_replay_equals_eager"]
    # the prompt set holds both classes as the bf16 model sees them
    assert 0 < sum(r["labels_ref"]) < len(r["labels_ref"])
