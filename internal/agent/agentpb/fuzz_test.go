package agentpb

import (
	"bytes"
	"encoding/hex"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The protobuf runtime (a test-only import: see TestAgentStaysLean) is the
// reference the hand-written coders are checked against. agentProto is
// agent.proto's messages as a descriptor, built here because the generated
// code is not kept; dynamicpb messages of it marshal exactly as the
// generated types would.
var agentProto = func() protoreflect.FileDescriptor {
	s := proto.String
	type fd = descriptorpb.FieldDescriptorProto
	lbl := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	rep := descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	field := func(name string, num int32, t descriptorpb.FieldDescriptorProto_Type, l *descriptorpb.FieldDescriptorProto_Label, typeName string, oneof *int32) *fd {
		f := &fd{Name: s(name), Number: proto.Int32(num), Type: t.Enum(), Label: l, JsonName: s(name), OneofIndex: oneof}
		if typeName != "" {
			f.TypeName = s(".airlock.agent.v1." + typeName)
		}
		return f
	}
	const (
		str = descriptorpb.FieldDescriptorProto_TYPE_STRING
		byt = descriptorpb.FieldDescriptorProto_TYPE_BYTES
		i32 = descriptorpb.FieldDescriptorProto_TYPE_INT32
		i64 = descriptorpb.FieldDescriptorProto_TYPE_INT64
		boo = descriptorpb.FieldDescriptorProto_TYPE_BOOL
		msg = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
	)
	o := proto.Int32(0)
	msgs := []*descriptorpb.DescriptorProto{
		{Name: s("HelloRequest")},
		{Name: s("HelloResponse"), Field: []*fd{field("version", 1, str, lbl, "", nil), field("kernel", 2, str, lbl, "", nil), field("uptime_ns", 3, i64, lbl, "", nil)}},
		{Name: s("ExecStart"), Field: []*fd{field("argv", 1, str, rep, "", nil), field("env", 2, str, rep, "", nil), field("working_dir", 3, str, lbl, "", nil),
			field("user", 4, str, lbl, "", nil), field("stdin", 5, boo, lbl, "", nil), field("timeout_ns", 6, i64, lbl, "", nil), field("kill_grace_ns", 7, i64, lbl, "", nil)}},
		{Name: s("ExecRequest"), Field: []*fd{field("start", 1, msg, lbl, "ExecStart", o), field("stdin", 2, byt, lbl, "", o), field("close_stdin", 3, boo, lbl, "", o),
			field("signal", 4, i32, lbl, "", o), field("kill", 5, boo, lbl, "", o)}, OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: s("msg")}}},
		{Name: s("ExecStarted"), Field: []*fd{field("pid", 1, i32, lbl, "", nil), field("spawn_ns", 2, i64, lbl, "", nil)}},
		{Name: s("ExecExit"), Field: []*fd{field("exit_code", 1, i32, lbl, "", nil), field("signal", 2, i32, lbl, "", nil), field("timed_out", 3, boo, lbl, "", nil),
			field("error", 4, str, lbl, "", nil), field("guest_ns", 5, i64, lbl, "", nil)}},
		{Name: s("ExecEvent"), Field: []*fd{field("started", 1, msg, lbl, "ExecStarted", o), field("stdout", 2, byt, lbl, "", o), field("stderr", 3, byt, lbl, "", o),
			field("exit", 4, msg, lbl, "ExecExit", o)}, OneofDecl: []*descriptorpb.OneofDescriptorProto{{Name: s("msg")}}},
		{Name: s("ShutdownRequest")},
		{Name: s("ShutdownResponse")},
	}
	f, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{Name: s("agent.proto"), Package: s("airlock.agent.v1"), Syntax: s("proto3"), MessageType: msgs}, nil)
	if err != nil {
		panic(err)
	}
	return f
}()

func newDynamic(name string) *dynamicpb.Message {
	return dynamicpb.NewMessage(agentProto.Messages().ByName(protoreflect.Name(name)))
}

// clearUnknown drops the unknown fields the runtime keeps (the hand-written
// coders skip them), in m and its nested messages.
func clearUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() {
			clearUnknown(v.Message())
		}
		return true
	})
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// FuzzCodersMatchProtobuf feeds the same bytes to the protobuf runtime and
// to the hand-written decoder of each message: what the runtime accepts,
// the hand-written decoder accepts too, and both encode what they decoded
// into the same bytes.
func FuzzCodersMatchProtobuf(f *testing.F) {
	for _, g := range golden {
		b, _ := hexBytes(g.hex)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0x08, 0x01, 0x0a, 0x02, 0x10, 0x02}) // a message field twice: merged
	f.Fuzz(func(t *testing.T, b []byte) {
		for name, newHand := range map[string]func() wireMessage{
			"HelloResponse": func() wireMessage { return new(HelloResponse) },
			"ExecStart":     func() wireMessage { return new(ExecStart) },
			"ExecRequest":   func() wireMessage { return new(ExecRequest) },
			"ExecStarted":   func() wireMessage { return new(ExecStarted) },
			"ExecExit":      func() wireMessage { return new(ExecExit) },
			"ExecEvent":     func() wireMessage { return new(ExecEvent) },
		} {
			dyn := newDynamic(name)
			if err := proto.Unmarshal(b, dyn); err != nil {
				continue // the hand-written decoder may be more lenient (it does not check UTF-8)
			}
			hand := newHand()
			if err := hand.UnmarshalWire(b); err != nil {
				t.Fatalf("%s %x: protobuf decodes it, the hand-written decoder fails: %v", name, b, err)
			}
			clearUnknown(dyn)
			want, err := deterministic.Marshal(dyn)
			if err != nil {
				t.Fatal(err)
			}
			if got := hand.AppendWire(nil); !bytes.Equal(got, want) {
				t.Fatalf("%s %x: decoded and encoded again: hand-written %x, protobuf %x", name, b, got, want)
			}
		}
	})
}

// FuzzExecStartEncoding builds the same ExecStart in both and compares the
// encodings (the bytes-driven fuzz rarely reaches long valid ones).
func FuzzExecStartEncoding(f *testing.F) {
	f.Add("sh", "-c", "A=1", "/root", "1000:1000", true, int64(3e9), int64(-1))
	f.Add("", "", "", "", "", false, int64(0), int64(0))
	f.Fuzz(func(t *testing.T, a0, a1, env, wd, user string, stdin bool, timeout, grace int64) {
		for _, s := range []string{a0, a1, env, wd, user} {
			if !utf8.ValidString(s) {
				return // proto3 strings are UTF-8; the runtime refuses others
			}
		}
		hand := &ExecStart{Argv: []string{a0, a1}, Env: []string{env}, WorkingDir: wd, User: user, Stdin: stdin, TimeoutNs: timeout, KillGraceNs: grace}
		dyn := newDynamic("ExecStart")
		fs := dyn.Descriptor().Fields()
		argv := dyn.Mutable(fs.ByName("argv")).List()
		argv.Append(protoreflect.ValueOfString(a0))
		argv.Append(protoreflect.ValueOfString(a1))
		dyn.Mutable(fs.ByName("env")).List().Append(protoreflect.ValueOfString(env))
		set := func(n string, v protoreflect.Value) { dyn.Set(fs.ByName(protoreflect.Name(n)), v) }
		set("working_dir", protoreflect.ValueOfString(wd))
		set("user", protoreflect.ValueOfString(user))
		set("stdin", protoreflect.ValueOfBool(stdin))
		set("timeout_ns", protoreflect.ValueOfInt64(timeout))
		set("kill_grace_ns", protoreflect.ValueOfInt64(grace))
		want, err := deterministic.Marshal(dyn)
		if err != nil {
			t.Fatal(err)
		}
		if got := hand.AppendWire(nil); !bytes.Equal(got, want) {
			t.Fatalf("hand-written %x, protobuf %x", got, want)
		}
	})
}

func hexBytes(h string) ([]byte, error) { return hex.DecodeString(h) }
