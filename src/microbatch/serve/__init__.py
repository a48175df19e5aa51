"""Running servers: microbatch's own HTTP/1.1 connection layer, several HTTP
processes in front of one hub (``serve --workers``), signals and drain."""
