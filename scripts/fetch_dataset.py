"""Fetch and unpack one configured download into ``params.target``; record what was done.

Output: the flag ``resources/data/<name>.done``, JSON with the source, archive, size and
sha256 that were unpacked (or the folder that is used in place). Settings: ``params.entry``
(config ``downloads.<name>``: source, archive, sha256/md5, optional caps max_bytes and
max_members), ``params.archive`` (where a downloaded archive is kept), ``params.target``.
"""

from verbmirage.workflow.jobserver import delegate

delegate()  # a local run's warm job server runs this job when there is one (verbmirage.workflow.jobserver)

import json
import sys

from verbmirage.data.download import Source, completion_record, prepare
from verbmirage.data.archives import MAX_BYTES, MAX_MEMBERS
from verbmirage.core.paths import write_text
from verbmirage.core.joblog import job_log

with job_log(snakemake.log[0]) as log:
    name, entry = snakemake.wildcards.download, snakemake.params.entry
    checksums = {key: entry[key] for key in ("sha256", "md5") if entry.get(key)}
    if not checksums and Source.parse(entry["source"]).kind != "local":
        print(f"WARNING: downloads.{name} has no sha256/md5: {entry['source']} is unverified "
              f"(the job log gives the sha256 to pin)", file=sys.__stderr__)
    target = prepare(
        entry["source"], snakemake.params.archive, snakemake.params.target, checksums, name=name,
        max_bytes=entry.get("max_bytes", MAX_BYTES), max_members=entry.get("max_members", MAX_MEMBERS),
    )
    record = completion_record(entry["source"], target)
    write_text(snakemake.output[0], json.dumps(record, indent=1, sort_keys=True) + "\n")
    log.info("%s ready in %s", name, target)
