"""goald's goal engine: durable goals that advance at whole-agent idle (imports ``agent`` only)."""
