"""Running servers: the HTTP/1.1 connection layer under uvicorn, several HTTP
processes in front of one hub (``serve --workers``), signals and drain."""
