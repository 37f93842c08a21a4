"""Generated code; see the .proto files beside it."""
