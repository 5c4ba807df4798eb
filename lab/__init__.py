"""GhostEdit's lab: what measures and explains the product without being part of it. docs/ renders the measured
figures from the committed results, probes/ holds the GPU probes (lab/probes/README.md: question, finding, status),
results/ the experiments' results and LOG.md what they found. Nothing here ships in the package (pyproject.toml
packages only ghostedit)."""
