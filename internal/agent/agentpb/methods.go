package agentpb

// The calls of the Agent service (agent.proto), as the host names them in
// a call's header and the agent dispatches on them.
const (
	MethodHello    = "Hello"
	MethodExec     = "Exec"
	MethodShutdown = "Shutdown"
)
