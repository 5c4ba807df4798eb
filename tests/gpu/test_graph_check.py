"""The DiT's forward replayed from CUDA graphs (`cuda-graph`) equals the forward run from Python bit for bit:
graph_check.py on the full-size synthetic DiT with the best configuration, four varied inputs with zero_cond_t off
and on."""
import json

from gpu_scripts import run_script


def test_the_replayed_forward_is_the_forward_run_from_python_bit_for_bit(tmp_path):
    run_script("graph_check.py", "--out", str(tmp_path))
    report = json.loads((tmp_path / "graph-check" / "graph-check.json").read_text())
    assert set(report["runs"]) == {"zero_cond_t=False", "zero_cond_t=True"}
    for setting, run in report["runs"].items():
        assert run["bitwise_equal"] == [True] * 4, setting
        assert run["outputs_differ_between_inputs"], setting              # four inputs, not one four times
        assert not run["words"]["cuda-graph"].startswith("0 of"), setting  # the graphs replayed
