"""The OpenAI Batch API: input files, batches, and the workers that answer their lines in a low-priority lane.

`objects` (the file and batch objects as OpenAI shows them), `files` (their bytes on disk), `store` (their state in
Redis), `expiry` (files deleted once they expire), `input` (a batch input file's lines, checked), `queue` (lines
shared among workers: a Redis Streams consumer group), `runner` (one line through the chat service, as an
interactive request goes), `worker` (takes, answers and finishes lines), `finalize` (a batch's output and error
files), `lane` (a line sent only while its pool has headroom), `service` (what the HTTP routes call), `metrics`.
"""
