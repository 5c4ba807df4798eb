"""The Qwen-Image family: its DiT, GhostEdit's own forward over the parameters DiffSynth loads (dit.py)."""
