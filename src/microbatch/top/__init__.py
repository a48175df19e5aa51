"""``microbatch top URL``: a live terminal view of a running server, from its
``/metrics`` (see :mod:`.snapshot`, :mod:`.view`, :mod:`.screen`, :mod:`.live`)."""
