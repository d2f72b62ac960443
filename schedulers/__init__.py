"""Built-in scheduling policies, written only against twin's public API.

Importing a module registers its policy; the ``twin.schedulers`` entry-point
group (see pyproject.toml) lists them so that a lookup finds them.
"""
