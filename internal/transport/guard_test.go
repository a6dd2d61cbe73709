package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
)

func yamuxFrame(typ byte, flags uint16, id, length uint32, payload []byte) []byte {
	h := make([]byte, yamuxHeader, yamuxHeader+len(payload))
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], id)
	binary.BigEndian.PutUint32(h[8:12], length)
	return append(h, payload...)
}

// The guard follows frame boundaries however the bytes arrive: data
// payloads that hold ping headers are data, and only real ping frames
// count against the limit.
func TestGuardFollowsFrames(t *testing.T) {
	ping := yamuxFrame(yamuxTypePing, 1, 0, 7, nil)
	payload := bytes.Repeat(ping, 1000) // 12000 bytes that look like pings
	var stream []byte
	for i := 0; i < 20; i++ {
		stream = append(stream, yamuxFrame(yamuxTypeData, 0, 1, uint32(len(payload)), payload)...)
		stream = append(stream, yamuxFrame(1 /* window update */, 0, 1, 1<<20, nil)...)
		stream = append(stream, ping...) // 20 real pings: within the burst
	}
	g := newGuardConn(nil)
	for b := stream; len(b) > 0; {
		k := min(len(b), 1+rand.IntN(40))
		if err := g.scan(b[:k]); err != nil {
			t.Fatalf("cut off at byte %d: %v", len(stream)-len(b), err)
		}
		b = b[k:]
	}
	// Past the burst, without time to refill: cut off.
	var err error
	for i := 0; i < pingBurst && err == nil; i++ {
		err = g.scan(ping)
	}
	if !errors.Is(err, ErrHostileAgent) {
		t.Fatalf("after %d pings at once: %v, want ErrHostileAgent", 20+pingBurst, err)
	}
}

// FuzzHostReadsGuestFrames feeds arbitrary bytes, as a guest sends them on
// a call's stream, to the host's frame reader and to the decoders of the
// messages the host reads (file and exec replies): errors, never a panic,
// and nothing decoded is larger than its frame.
func FuzzHostReadsGuestFrames(f *testing.F) {
	frame := func(kind byte, p []byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(p)+1))
		return append(append(b, kind), p...)
	}
	f.Add(frame(frameMsg, []byte{0x0a, 0x04, 'e', 'v', 'i', 'l'}))                          // FileDown data
	f.Add(frame(frameMsg, []byte{0x12, 0x06, 0x0a, 0x04, 0x0a, 0x02, 'o', 'k'}))            // FileDown result with one info
	f.Add(frame(frameError, []byte("no such file")))                                        // a failed call
	f.Add(append(frame(frameMsg, nil), frame(frameMsg, []byte{0x22, 0x02, 0x08, 0x01})...)) // exec: exit 1
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, frameMsg})                                         // 4 GiB announced
	f.Add([]byte{0x00, 0x40, 0x00, 0x01, frameMsg, 1, 2, 3})                                // 4 MiB announced, 3 sent
	f.Add(frame(frameMsg, []byte{0x12, 0xff, 0xff, 0xff, 0xff, 0x0f}))                      // a length past the frame
	f.Add(frame(frameMsg, bytes.Repeat([]byte{0x0a, 0x80, 0x80, 0x80, 0x80, 0x10}, 100)))   // huge varint lengths
	f.Add(frame(7, []byte("kind 7")))                                                       // an unknown kind
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var hdr [frameHeader]byte
		for {
			kind, p, err := readFrame(r, &hdr, "Fuzz")
			if err != nil {
				return
			}
			if len(p) > MaxFrame || len(p) > len(data) {
				t.Fatalf("a frame of %d bytes from %d bytes of input", len(p), len(data))
			}
			if kind != frameMsg {
				continue
			}
			var fd agentpb.FileDown
			if fd.UnmarshalWire(p) == nil {
				if d, ok := fd.Msg.(*agentpb.FileDown_Data); ok && len(d.Data) > len(p) {
					t.Fatalf("data of %d bytes from a frame of %d", len(d.Data), len(p))
				}
				if res, ok := fd.Msg.(*agentpb.FileDown_Result); ok && res.Result != nil {
					for _, i := range res.Result.Infos {
						if len(i.Name)+len(i.Link) > len(p) {
							t.Fatalf("names of %d bytes from a frame of %d", len(i.Name)+len(i.Link), len(p))
						}
					}
				}
			}
			var ev agentpb.ExecEvent
			ev.UnmarshalWire(p)
			var hr agentpb.HelloResponse
			hr.UnmarshalWire(p)
		}
	})
}

// A box unpaused after a long pause answers the host's queued keepalive
// pings at once: answers (ACK) are no ping requests and do not count.
func TestGuardLetsPingAnswersThrough(t *testing.T) {
	ack := yamuxFrame(yamuxTypePing, 2, 0, 7, nil)
	g := newGuardConn(nil)
	for i := 0; i < 10*pingBurst; i++ {
		if err := g.scan(ack); err != nil {
			t.Fatalf("ping answer %d cut the connection: %v", i, err)
		}
	}
}
