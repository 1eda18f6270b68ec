"""What the worker's zygote reads ahead between traces (`Zygote._warm`): each source file of the last trace parsed
and hashed in the zygote, so that the children it forks next inherit both, until the next request arrives."""

from __future__ import annotations

import os
from pathlib import Path

from modeltrace.worker import assemble, source_map
from modeltrace.worker import zygote as zygote_module
from modeltrace.worker.zygote import Zygote


def test_the_zygote_reads_a_traces_files_ahead_until_a_request_arrives(tmp_path: Path) -> None:
    files = []
    for number in range(3):
        file = tmp_path / f"modeling_{number}.py"
        file.write_text(f"import torch\n\n\nclass Block{number}(torch.nn.Module):\n    pass\n")
        files.append(str(file))
    requests, client = os.pipe()
    answers = os.open(os.devnull, os.O_WRONLY)
    try:
        zygote = Zygote(requests, answers)
        large = tmp_path / "modeling_generated.py"
        large.write_text("x = 1\n" * (zygote_module.WARM_MAX_BYTES // 6 + 1))
        gone = str(tmp_path / "modeling_deleted.py")
        # NOTE: what is not a file name, a file that is gone and one over the size limit are passed over
        zygote._warm([files[0], 7, None, gone, str(large)])
        assert str(large) not in source_map._file_index_cache and gone not in source_map._file_index_cache
        assert source_map._file_index_cache[files[0]].classes == {"Block0": 4}
        assert assemble._HASHES[files[0]][2] == assemble.source_hash(files[0])
        os.write(client, b"\0")  # a request is waiting: nothing more is read ahead
        zygote._warm(files[1:])
        assert files[1] not in source_map._file_index_cache and files[1] not in assemble._HASHES
        # and only the last trace's files are kept: the first one's parse is gone
        assert files[0] not in source_map._file_index_cache
    finally:
        for descriptor in (requests, client, answers):
            os.close(descriptor)
