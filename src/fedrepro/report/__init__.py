"""Aggregate run outputs and render tables and figures beside the published numbers.

Modules: ``collect`` (run folders -> tidy frames, atomic CSV writes), ``published`` (the papers'
numbers), ``tables`` (markdown/LaTeX/CSV tables), ``figures`` (curves), ``style`` (shared colours).
Nothing is re-exported here so that a table job does not pay for importing matplotlib.
"""
