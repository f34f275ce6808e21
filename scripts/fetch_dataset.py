"""Fetch and unpack one configured download into ``params.target``.

Settings: ``params.entry`` (config ``downloads.<name>``: source, archive, sha256/md5),
``params.archive`` (where a downloaded archive is kept).
"""

from verbmirage.download import prepare
from verbmirage.joblog import job_log

with job_log(snakemake.log[0]) as log:
    entry = snakemake.params.entry
    checksums = {key: entry[key] for key in ("sha256", "md5") if entry.get(key)}
    target = prepare(entry["source"], snakemake.params.archive, snakemake.params.target, checksums)
    log.info("%s ready in %s", snakemake.wildcards.download, target)
