package agentpb

// The calls of the Agent service (agent.proto), as the host names them in
// a call's header and the agent dispatches on them.
const (
	MethodHello    = "Hello"
	MethodExec     = "Exec"
	MethodShutdown = "Shutdown"
	// MethodRestored: the box was restored from a memory snapshot.
	MethodRestored = "Restored"
	// MethodFreeze: stop or continue the box's processes around a memory
	// snapshot.
	MethodFreeze = "Freeze"
)
