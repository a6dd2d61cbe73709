package agentpb

// FreezeRequest stops (Freeze true) or continues the box's processes
// around a memory snapshot (Freeze): every process an exec started, in
// the cgroup v2 freezer. A box restored from the snapshot starts with
// them stopped; Restored continues them after it has reseeded the RNG, so
// that none of them reads the RNG state the restored boxes share.
type FreezeRequest struct {
	Freeze bool
}

// FreezeResponse answers Freeze once the processes are stopped (or
// continued).
type FreezeResponse struct{}

// AppendWire appends m in the protobuf wire format.
func (m *FreezeRequest) AppendWire(b []byte) []byte { return appendBool(b, 1, m.Freeze) }

// UnmarshalWire replaces m with the message encoded in b.
func (m *FreezeRequest) UnmarshalWire(b []byte) error {
	*m = FreezeRequest{}
	return eachField(b, func(f field) error {
		if f.num == 1 && f.isVarint() {
			m.Freeze = f.u != 0
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *FreezeResponse) AppendWire(b []byte) []byte { return b }

// UnmarshalWire replaces m with the message encoded in b.
func (m *FreezeResponse) UnmarshalWire(b []byte) error {
	*m = FreezeResponse{}
	return eachField(b, func(field) error { return nil })
}
