"""The write-ahead log: record framing, reading with torn-tail detection, batch encoding.

docs/format.md, "Write-ahead log" is the spec. Typical use by the DB::

    w = LogWriter(fs.open_writable(filenames.log_file_name(dirname, number)))
    w.add_record(encode_batch(seq, [(KIND_VALUE, key, value)]))
    w.sync()                                  # acknowledged only after this
    ...
    for payload in read_log(fs, path):        # on open
        first_seq, ops = decode_batch(payload)
"""

from .batch import decode_batch, encode_batch, encoded_size
from .reader import LogReadResult, parse_log, read_log
from .writer import LogWriter

__all__ = ["LogWriter", "LogReadResult", "read_log", "parse_log", "encode_batch", "decode_batch",
           "encoded_size"]
