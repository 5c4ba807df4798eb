"""The measured-figure blocks of the project's pages and the app's package data, generated from the committed
results (render.py); `python -m lab.docs` rewrites them."""
