"""Data sets: download (download.py), build (embedded.py, vision.py) and store them (format.py).

registry.py lists every data set by name. Nothing here imports torch.
"""
