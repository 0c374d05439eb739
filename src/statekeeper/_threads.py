"""Moved to :mod:`statekeeper._runtime.threads`; this name stays for the file store."""

from ._runtime.threads import ThreadDoor as ThreadDoor
