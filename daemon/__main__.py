"""``python -m daemon`` runs the ``goald`` command."""

from daemon.cli import entrypoint

entrypoint()
