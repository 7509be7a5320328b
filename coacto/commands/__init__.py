"""The `coacto` command's subcommands, one module per family: each holds its commands' parsers
(``add_*_parser``) and their ``cmd_*`` functions; coacto.cli assembles them and runs ``main``.

- ``shared``: model resolution, model flags, input loading, output comparison
- ``model``: compile, run
- ``measure``: bench, tune, profile
- ``demo``: demo
- ``keygen``: keygen
"""
