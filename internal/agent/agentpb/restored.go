package agentpb

import "google.golang.org/protobuf/encoding/protowire"

// RestoredRequest tells the agent of a box restored from a memory snapshot
// what must differ from the snapshot's guest (Restored).
type RestoredRequest struct {
	// Entropy is fresh host randomness the agent adds to the kernel's
	// entropy pool (RNDADDENTROPY), so that boxes restored from one
	// snapshot do not share their RNG state. At most MaxRestoredEntropy
	// bytes are used.
	Entropy []byte
	// UnixNs is the host's wall-clock time (ns since the Unix epoch) when
	// the request was made: the guest clock is stepped to it.
	UnixNs int64
	// Hostname is the restored box's hostname.
	Hostname string
}

// MaxRestoredEntropy bounds RestoredRequest.Entropy (bytes).
const MaxRestoredEntropy = 4096

// RestoredResponse answers Restored.
type RestoredResponse struct {
	// StepNs is how far the guest clock was stepped forward (ns;
	// negative: back).
	StepNs int64
}

// AppendWire appends m in the protobuf wire format.
func (m *RestoredRequest) AppendWire(b []byte) []byte {
	if len(m.Entropy) > 0 {
		b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), m.Entropy)
	}
	b = appendInt(b, 2, m.UnixNs)
	return appendString(b, 3, m.Hostname)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *RestoredRequest) UnmarshalWire(b []byte) error {
	*m = RestoredRequest{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			m.Entropy = append([]byte(nil), f.p...)
		case f.num == 2 && f.isVarint():
			m.UnixNs = int64(f.u)
		case f.num == 3 && f.isBytes():
			m.Hostname = string(f.p)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *RestoredResponse) AppendWire(b []byte) []byte { return appendInt(b, 1, m.StepNs) }

// UnmarshalWire replaces m with the message encoded in b.
func (m *RestoredResponse) UnmarshalWire(b []byte) error {
	*m = RestoredResponse{}
	return eachField(b, func(f field) error {
		if f.num == 1 && f.isVarint() {
			m.StepNs = int64(f.u)
		}
		return nil
	})
}
