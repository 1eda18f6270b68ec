"""The corpus's two records, a pair and a bug, and the source of the transformers conversion scripts.

Split from `corpus.py` (which holds the pairs and bugs themselves) so that a pair defined in a module of its own
(`corpus_encodec.py`) builds the same records; `corpus.py` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ports.sources import Source, SourceFile, staged_pair_folder

CORPUS_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Pair:
    """A reference and its port. `maps` rename candidate module paths to the reference's (`--map` rules, full
    paths on both sides); `unmapped` names port modules left unaligned on purpose, with the reason."""

    name: str
    folder: str
    port_file: str
    reference_module: str  # the transformers modeling module (its file is the reference's traced file)
    maps: tuple[str, ...]
    unmapped: str = ""
    # the reference's traced file inside the pair folder when it is not the transformers module (the independent
    # vision and speech implementations are the references there, and the transformers file copied in is the port)
    reference_file: str = ""
    # other files of the reference whose lines are captured too (`modeltrace trace --follow`), inside the pair
    # folder: code the reference's forward runs outside its traced file through methods, not module calls (a
    # quantizer's `encode`), whose line values are the only values of it a diff can compare
    reference_follow: tuple[str, ...] = ()
    # published implementations the port is (not committed: materialised from a mirror, see ports/sources.py)
    sources: tuple[Source, ...] = ()

    @property
    def path(self) -> Path:
        """The pair's folder; with sources, a staged copy of it holding the sources' files too."""
        if self.sources:
            return staged_pair_folder(self.folder, CORPUS_ROOT / self.folder, self.sources)
        return CORPUS_ROOT / self.folder


@dataclass(frozen=True)
class Bug:
    """One porting bug: replace `old` (exactly one occurrence in the port file) by `new`; `module` is the port's
    path of the module owning the bug ("" for the root); `truth_at` (optional) the text on the truth line when it is not the
    patched line; `why` says what is wrong, as a reviewer would; `patched_file` and `helper` below."""

    name: str
    pair: str
    kind: str
    old: str
    new: str
    module: str
    why: str
    truth_at: str | None = None
    # the file patched, relative to the prepared case folder (the pair folder's parent), when it is not the
    # port file: a converter shared by pairs (`meta_convert.py`); `truth_at` then names the line in the port
    patched_file: str = ""
    # the port file's module-level function holding the truth line, when the module calls a helper there
    helper: str = ""
    # the bug reaches `module` through this input, which has no counterpart in the reference (a rotary table
    # built in the root's `__init__`): the module's other inputs are unchanged, that one is not
    unpaired_input: str = ""


def transformers_conversion(script: str, sha256: str) -> Source:
    """transformers' conversion script for a vision or speech pair (its weights are converted by the script's own
    functions, `vision_common.upstream_definitions`): the wheel does not ship these scripts, so they are staged
    from a mirrored snapshot of a transformers fork whose package is renamed `transformers_4573` (the functions
    used do not import it)."""
    return Source(
        repo="feisenyu/transformers_4573",
        commit="e9d73c31189a2235385bbaf4be9224d9d5c8a1fc",
        license="LICENSE",
        files=(SourceFile(f"src/transformers_4573/models/{script}", f"upstream/{script.split('/')[-1]}", sha256),),
    )
