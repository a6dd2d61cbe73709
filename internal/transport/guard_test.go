package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
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
