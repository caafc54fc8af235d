"""A folder of markdown notes with front matter and [[wikilinks]], and which notes belong to which model.

`folder` reads the notes, `wikilinks` finds and renders their links, `matching` says which
notes belong to which model and which links name nothing, `names` lists a config's names.
"""
