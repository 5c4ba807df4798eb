"""`python -m lab.docs`: rewrite the figure blocks and the package data from the committed results."""
from .render import main

main()
