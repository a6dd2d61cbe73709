package agentpb

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// The messages of agent.proto, written by hand: each encodes itself in the
// protobuf wire format (proto3: zero-valued fields are left out, except a
// oneof's chosen field) with protowire, and decodes the same, skipping
// fields it does not know. Field numbers must match agent.proto.

// HelloRequest asks the agent who it is (Hello).
type HelloRequest struct{}

// HelloResponse answers Hello.
type HelloResponse struct {
	Version  string // agent protocol version (Version)
	Kernel   string // guest kernel release
	UptimeNs int64  // guest uptime, ns
}

// ExecStart starts a process (first message of Exec).
type ExecStart struct {
	Argv        []string
	Env         []string // KEY=VALUE
	WorkingDir  string
	User        string // "", name, uid, name:group, uid:gid
	Stdin       bool   // the caller sends stdin; else it reads as empty
	TimeoutNs   int64  // 0: none
	KillGraceNs int64  // SIGTERM to SIGKILL on timeout/kill; 0: default
}

// ExecRequest is one client message of an Exec call: Msg is one of
// *ExecRequest_Start (first), *ExecRequest_Stdin, *ExecRequest_CloseStdin,
// *ExecRequest_Signal, *ExecRequest_Kill.
type ExecRequest struct {
	Msg isExecRequest_Msg
}

type isExecRequest_Msg interface{ isExecRequest_Msg() }

// ExecRequest_Start starts the process.
type ExecRequest_Start struct{ Start *ExecStart }

// ExecRequest_Stdin is a chunk of the process's stdin.
type ExecRequest_Stdin struct{ Stdin []byte }

// ExecRequest_CloseStdin closes the process's stdin.
type ExecRequest_CloseStdin struct{ CloseStdin bool }

// ExecRequest_Signal sends the process group a signal.
type ExecRequest_Signal struct{ Signal int32 }

// ExecRequest_Kill ends the process tree (SIGTERM, SIGKILL after the grace).
type ExecRequest_Kill struct{ Kill bool }

func (*ExecRequest_Start) isExecRequest_Msg()      {}
func (*ExecRequest_Stdin) isExecRequest_Msg()      {}
func (*ExecRequest_CloseStdin) isExecRequest_Msg() {}
func (*ExecRequest_Signal) isExecRequest_Msg()     {}
func (*ExecRequest_Kill) isExecRequest_Msg()       {}

// GetStart returns the ExecStart of a start request, or nil.
func (x *ExecRequest) GetStart() *ExecStart {
	if s, ok := x.Msg.(*ExecRequest_Start); ok {
		return s.Start
	}
	return nil
}

// ExecStarted says the process runs.
type ExecStarted struct {
	Pid     int32 // in the guest
	SpawnNs int64 // time the agent took to start it, ns
}

// ExecExit ends an Exec call's replies.
type ExecExit struct {
	ExitCode int32 // 128+N when killed by signal N, -1 when it never started
	Signal   int32 // the signal that killed it, or 0
	TimedOut bool
	Error    string // why it could not start, or ""
	GuestNs  int64  // start to exit, measured in the guest, ns
}

// ExecEvent is one agent message of an Exec call: Msg is one of
// *ExecEvent_Started (first), *ExecEvent_Stdout, *ExecEvent_Stderr,
// *ExecEvent_Exit (last).
type ExecEvent struct {
	Msg isExecEvent_Msg
}

type isExecEvent_Msg interface{ isExecEvent_Msg() }

// ExecEvent_Started says the process runs.
type ExecEvent_Started struct{ Started *ExecStarted }

// ExecEvent_Stdout is a chunk of the process's stdout.
type ExecEvent_Stdout struct{ Stdout []byte }

// ExecEvent_Stderr is a chunk of the process's stderr.
type ExecEvent_Stderr struct{ Stderr []byte }

// ExecEvent_Exit says how the process ended.
type ExecEvent_Exit struct{ Exit *ExecExit }

func (*ExecEvent_Started) isExecEvent_Msg() {}
func (*ExecEvent_Stdout) isExecEvent_Msg()  {}
func (*ExecEvent_Stderr) isExecEvent_Msg()  {}
func (*ExecEvent_Exit) isExecEvent_Msg()    {}

// GetExit returns the ExecExit of an exit event, or nil.
func (x *ExecEvent) GetExit() *ExecExit {
	if e, ok := x.Msg.(*ExecEvent_Exit); ok {
		return e.Exit
	}
	return nil
}

// ShutdownRequest asks the agent to power the VM off.
type ShutdownRequest struct{}

// ShutdownResponse answers Shutdown (before the power-off).
type ShutdownResponse struct{}

// Encoding helpers: proto3 leaves zero values out.

func appendString(b []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func appendInt(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	// int32 and int64 alike: negative values are 10-byte varints.
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), uint64(v))
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}

// appendField appends a oneof field: present even when zero.
func appendField(b []byte, num protowire.Number, typ protowire.Type, varint uint64, bytes []byte) []byte {
	b = protowire.AppendTag(b, num, typ)
	if typ == protowire.VarintType {
		return protowire.AppendVarint(b, varint)
	}
	return protowire.AppendBytes(b, bytes)
}

func appendMessage(b []byte, num protowire.Number, m interface{ AppendWire([]byte) []byte }) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m.AppendWire(nil))
}

// field is one decoded field: u holds a varint's value, p a
// length-delimited field's payload (aliasing the input).
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64
	p   []byte
}

// eachField calls fn with the varint and length-delimited fields of the
// encoded message b, in order, and skips fields of the other wire types. It
// stops at the first error fn returns.
func eachField(b []byte, fn func(f field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("agent message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			f.p, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("agent message: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.VarintType || typ == protowire.BytesType {
			if err := fn(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// isBytes and isVarint check a known field's wire type; a field with
// another wire type than agent.proto gives it is skipped, as protobuf does
// with unknown fields.
func (f field) isBytes() bool  { return f.typ == protowire.BytesType }
func (f field) isVarint() bool { return f.typ == protowire.VarintType }

// AppendWire appends m in the protobuf wire format.
func (m *HelloRequest) AppendWire(b []byte) []byte { return b }

// UnmarshalWire replaces m with the message encoded in b.
func (m *HelloRequest) UnmarshalWire(b []byte) error {
	return eachField(b, func(field) error { return nil })
}

// AppendWire appends m in the protobuf wire format.
func (m *HelloResponse) AppendWire(b []byte) []byte {
	b = appendString(b, 1, m.Version)
	b = appendString(b, 2, m.Kernel)
	return appendInt(b, 3, m.UptimeNs)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *HelloResponse) UnmarshalWire(b []byte) error {
	*m = HelloResponse{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			m.Version = string(f.p)
		case f.num == 2 && f.isBytes():
			m.Kernel = string(f.p)
		case f.num == 3 && f.isVarint():
			m.UptimeNs = int64(f.u)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *ExecStart) AppendWire(b []byte) []byte {
	for _, s := range m.Argv {
		b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), s)
	}
	for _, s := range m.Env {
		b = protowire.AppendString(protowire.AppendTag(b, 2, protowire.BytesType), s)
	}
	b = appendString(b, 3, m.WorkingDir)
	b = appendString(b, 4, m.User)
	b = appendBool(b, 5, m.Stdin)
	b = appendInt(b, 6, m.TimeoutNs)
	return appendInt(b, 7, m.KillGraceNs)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *ExecStart) UnmarshalWire(b []byte) error {
	*m = ExecStart{}
	return m.mergeWire(b)
}

// mergeWire merges the message encoded in b into m, as protobuf merges a
// message field that appears more than once.
func (m *ExecStart) mergeWire(b []byte) error {
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			m.Argv = append(m.Argv, string(f.p))
		case f.num == 2 && f.isBytes():
			m.Env = append(m.Env, string(f.p))
		case f.num == 3 && f.isBytes():
			m.WorkingDir = string(f.p)
		case f.num == 4 && f.isBytes():
			m.User = string(f.p)
		case f.num == 5 && f.isVarint():
			m.Stdin = f.u != 0
		case f.num == 6 && f.isVarint():
			m.TimeoutNs = int64(f.u)
		case f.num == 7 && f.isVarint():
			m.KillGraceNs = int64(f.u)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *ExecRequest) AppendWire(b []byte) []byte {
	switch x := m.Msg.(type) {
	case *ExecRequest_Start:
		start := x.Start
		if start == nil {
			start = &ExecStart{}
		}
		b = appendMessage(b, 1, start)
	case *ExecRequest_Stdin:
		b = appendField(b, 2, protowire.BytesType, 0, x.Stdin)
	case *ExecRequest_CloseStdin:
		b = appendField(b, 3, protowire.VarintType, protowire.EncodeBool(x.CloseStdin), nil)
	case *ExecRequest_Signal:
		b = appendField(b, 4, protowire.VarintType, uint64(int64(x.Signal)), nil)
	case *ExecRequest_Kill:
		b = appendField(b, 5, protowire.VarintType, protowire.EncodeBool(x.Kill), nil)
	}
	return b
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *ExecRequest) UnmarshalWire(b []byte) error {
	*m = ExecRequest{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			x, ok := m.Msg.(*ExecRequest_Start)
			if !ok || x.Start == nil {
				x = &ExecRequest_Start{Start: &ExecStart{}}
				m.Msg = x
			}
			return x.Start.mergeWire(f.p)
		case f.num == 2 && f.isBytes():
			m.Msg = &ExecRequest_Stdin{Stdin: f.p}
		case f.num == 3 && f.isVarint():
			m.Msg = &ExecRequest_CloseStdin{CloseStdin: f.u != 0}
		case f.num == 4 && f.isVarint():
			m.Msg = &ExecRequest_Signal{Signal: int32(f.u)}
		case f.num == 5 && f.isVarint():
			m.Msg = &ExecRequest_Kill{Kill: f.u != 0}
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *ExecStarted) AppendWire(b []byte) []byte {
	b = appendInt(b, 1, int64(m.Pid))
	return appendInt(b, 2, m.SpawnNs)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *ExecStarted) UnmarshalWire(b []byte) error {
	*m = ExecStarted{}
	return m.mergeWire(b)
}

// mergeWire merges the message encoded in b into m, as protobuf merges a
// message field that appears more than once.
func (m *ExecStarted) mergeWire(b []byte) error {
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isVarint():
			m.Pid = int32(f.u)
		case f.num == 2 && f.isVarint():
			m.SpawnNs = int64(f.u)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *ExecExit) AppendWire(b []byte) []byte {
	b = appendInt(b, 1, int64(m.ExitCode))
	b = appendInt(b, 2, int64(m.Signal))
	b = appendBool(b, 3, m.TimedOut)
	b = appendString(b, 4, m.Error)
	return appendInt(b, 5, m.GuestNs)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *ExecExit) UnmarshalWire(b []byte) error {
	*m = ExecExit{}
	return m.mergeWire(b)
}

// mergeWire merges the message encoded in b into m, as protobuf merges a
// message field that appears more than once.
func (m *ExecExit) mergeWire(b []byte) error {
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isVarint():
			m.ExitCode = int32(f.u)
		case f.num == 2 && f.isVarint():
			m.Signal = int32(f.u)
		case f.num == 3 && f.isVarint():
			m.TimedOut = f.u != 0
		case f.num == 4 && f.isBytes():
			m.Error = string(f.p)
		case f.num == 5 && f.isVarint():
			m.GuestNs = int64(f.u)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *ExecEvent) AppendWire(b []byte) []byte {
	switch x := m.Msg.(type) {
	case *ExecEvent_Started:
		s := x.Started
		if s == nil {
			s = &ExecStarted{}
		}
		b = appendMessage(b, 1, s)
	case *ExecEvent_Stdout:
		b = appendField(b, 2, protowire.BytesType, 0, x.Stdout)
	case *ExecEvent_Stderr:
		b = appendField(b, 3, protowire.BytesType, 0, x.Stderr)
	case *ExecEvent_Exit:
		e := x.Exit
		if e == nil {
			e = &ExecExit{}
		}
		b = appendMessage(b, 4, e)
	}
	return b
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *ExecEvent) UnmarshalWire(b []byte) error {
	*m = ExecEvent{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			x, ok := m.Msg.(*ExecEvent_Started)
			if !ok || x.Started == nil {
				x = &ExecEvent_Started{Started: &ExecStarted{}}
				m.Msg = x
			}
			return x.Started.mergeWire(f.p)
		case f.num == 2 && f.isBytes():
			m.Msg = &ExecEvent_Stdout{Stdout: f.p}
		case f.num == 3 && f.isBytes():
			m.Msg = &ExecEvent_Stderr{Stderr: f.p}
		case f.num == 4 && f.isBytes():
			x, ok := m.Msg.(*ExecEvent_Exit)
			if !ok || x.Exit == nil {
				x = &ExecEvent_Exit{Exit: &ExecExit{}}
				m.Msg = x
			}
			return x.Exit.mergeWire(f.p)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *ShutdownRequest) AppendWire(b []byte) []byte { return b }

// UnmarshalWire replaces m with the message encoded in b.
func (m *ShutdownRequest) UnmarshalWire(b []byte) error {
	return eachField(b, func(field) error { return nil })
}

// AppendWire appends m in the protobuf wire format.
func (m *ShutdownResponse) AppendWire(b []byte) []byte { return b }

// UnmarshalWire replaces m with the message encoded in b.
func (m *ShutdownResponse) UnmarshalWire(b []byte) error {
	return eachField(b, func(field) error { return nil })
}
