"""The speed toggles, one file each: every module here registers its toggle with ghostedit.optimize.registry when
imported (the registry imports them all). A new toggle is one new file here and nothing else."""
