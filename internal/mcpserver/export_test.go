package mcpserver

// TimeoutOf is timeoutOf, for tests.
var TimeoutOf = timeoutOf
