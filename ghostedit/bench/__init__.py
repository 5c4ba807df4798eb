"""`ghostedit bench`: configurations one after another in one process, on the same inputs, at two levels:

pipeline.py  whole edits through the engine (one cold run, then warm ones)
dit.py       one DiT forward at an edit's shape, through the engine's own forward path, with CUDA events
output.py    the tables, charts and environment both write
command.py   the command's arguments (made from the toggle registry) and its run
"""
