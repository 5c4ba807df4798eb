"""Qwen-Image-2.1's CUDA graph replays equal its forwards run from Python bit for bit, edit after edit, with real
graphs on the GPU (qwen21_graphs.py): 0, 1 and 3 references, the prefix cache on and off."""
import json

from gpu_scripts import run_script


def test_the_2_1_replays_are_the_eager_forwards_bit_for_bit():
    result, = [line for line in run_script("qwen21_graphs.py").splitlines() if line.startswith("RESULT ")]
    cases = json.loads(result.split(" ", 1)[1])["cases"]
    assert len(cases) == 6
    for name, case in cases.items():
        assert all(all(step) for step in case["equal"]), (name, case)
        # the counts are the second edit's (a run's own): it replays every one of its four forwards
        assert case["replayed"] == 4, (name, case)
