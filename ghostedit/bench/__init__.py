"""`ghostedit bench`: configurations one after another on the same inputs, at these levels (and lora_switch.py):

pipeline.py  whole edits through the engine (one cold run, then warm ones)
dit.py       one DiT forward at an edit's shape, through the engine's own forward path, with CUDA events
latency.py   what a person waits for: the real app in a process of its own, /edit through gradio_client
output.py    the tables, charts and environment they write
command.py   the command's arguments (made from the toggle registry) and its run
"""
