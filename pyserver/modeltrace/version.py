"""The package's version, in a module of its own so that the code that reports it (a trace's header, the language
server's name) does not import the package's top, which offers the library (`api`) above everything else.
"""

from __future__ import annotations

__version__ = "0.1.0"
