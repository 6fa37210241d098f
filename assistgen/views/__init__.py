"""What a comparison's figures look like to a reader, for every front end: sentences (`text`) and charts (`plots`).

Above `comparison/`, which computes the values, and below `app/` (the page) and `tools/` (the command line), which
show them: the page and the CLI word a result with the same functions.
"""
