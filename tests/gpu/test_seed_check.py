"""The synthetic model's text encoder and VAE get the same weights whatever the process did before (seed_check.py):
a plain process and one that first draws random numbers and opens an NCCL group with a device mesh, as a torchrun
rank does (the 2-GPU run once found them different: lab/results/parallel/seed-check.txt)."""
import json

from gpu_scripts import run_script


def test_the_synthetic_weights_do_not_depend_on_what_the_process_did_before():
    fingerprints = {}
    for history in ("plain", "disturbed"):
        result, = [line for line in run_script("seed_check.py", "seeded", history).splitlines()
                   if line.startswith("RESULT ")]
        fingerprints[history] = json.loads(result.split(" ", 3)[3])
    for component in ("text_encoder", "vae"):  # the DiT is a stand-in there: it was always seeded
        assert fingerprints["plain"][component] == fingerprints["disturbed"][component], component
