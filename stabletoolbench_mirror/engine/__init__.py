"""What answers one call: the layer, single flight, sessions, local tools, the responder interface, counters."""
