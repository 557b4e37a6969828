"""The snapshot tools: read, explain, diff and trim `torch.cuda.memory` snapshots.

Apart from the trainer-side client (importing `gpumon_client` loads none of this), in layers,
each importing only those above it:

- reading: picklebase, pickleschema, picklerare, pickleread (the streaming pickle reader),
  shape (SnapshotError, validate), load (load/loads by what a command keeps);
- analysis: units, sites (which frame is the user's), state (the allocator at a point of the
  history), diff, explain, peak, trim, wire (fitting results into a protocol line);
- rendering: render (text for people);
- the command line: cli (`python -m gpumon_client diff | explain`).

The client imports analysis modules only when it needs them: the OOM observer's explanation, an
attribution window's diff, an armed trainer's peak.
"""
