"""Tools around the service: the embedded broker, the demo, the stream generator and the
JSON Lines producer. Nothing in the detector depends on them."""
