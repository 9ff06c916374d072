"""End-to-end tests: real servers on 127.0.0.1, real redis-server, real files and processes."""
