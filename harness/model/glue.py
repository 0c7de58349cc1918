"""The words of SGLang's metadata glue graph that the target's driver and the graph properties share.

A replay's prep through a ``MetadataGlueGraph`` (``targets/sglang/glue_graph``)
is one of: a warm-up (eager, the first two of a key), the capture (recorded,
then replayed at once), a replay of the captured graph, not routed (a padded
replay: SGLang prepares it eagerly by design), or eager after a failed capture
(SGLang's fallback, for good); on a DSpark server also a replay of it staged
early, before the verify step's load, which took it. The graph stand-in keys a glue graph's records
(``StaleRead.graph``) by ``(GLUE, key)``.
"""

from __future__ import annotations

GLUE = "metadata glue"
WARM_UP, CAPTURE, REPLAY, NOT_ROUTED, FAILED = "warm-up", "capture", "replay", "not routed", "capture failed"
#: a DSpark target verify replay that took the metadata its glue graph replayed when the step was staged early
EARLY = "early stage"
#: the outcomes whose prep the glue graph ran (the capture step replays its graph at once)
GLUED = (CAPTURE, REPLAY, EARLY)


def is_glue_graph(graph_key) -> bool:
    """Whether a graph stand-in record's graph key is a metadata glue graph's."""
    return isinstance(graph_key, tuple) and len(graph_key) == 2 and graph_key[0] == GLUE
