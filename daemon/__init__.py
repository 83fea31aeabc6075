"""goald's daemon: the long-running process, its control protocol, CLI and integrations."""

__version__ = "0.1.0"
