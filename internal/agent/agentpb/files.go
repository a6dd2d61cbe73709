package agentpb

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Messages of the file calls (Stat, ReadDir, MkdirAll, Remove, ReadFile,
// WriteFile, CopyIn, CopyOut; see agent.proto). Each call's client messages
// are FileUp (a request first, then data chunks ended by eof), its agent
// messages FileDown (data chunks and results; the last result has More
// unset).

// FileRequest is the first message of a file call.
type FileRequest struct {
	Path       string // in the box
	Mode       uint32 // io/fs.FileMode bits (WriteFile, MkdirAll)
	RenameFrom string // CopyIn: top-level archive entry to rename...
	RenameTo   string // ...to this ("." puts its contents in Path)
	Owners     bool   // CopyIn: apply the archive's owners
	SetOwner   bool   // CopyIn, WriteFile: own everything by Uid:Gid
	Uid        uint32
	Gid        uint32
	Follow     bool // Stat, CopyOut: follow a final symlink (inside the box)
}

// FileInfo describes one file (lstat, or stat with Follow).
type FileInfo struct {
	Name    string
	Size    int64
	Mode    uint32 // io/fs.FileMode bits
	MtimeNs int64  // Unix ns
	Uid     uint32
	Gid     uint32
	Link    string // symlink target
}

// FileResult is a file call's outcome, or a batch of ReadDir entries.
type FileResult struct {
	Infos []*FileInfo
	Error string // "" on success
	Errno int32  // the errno behind Error, 0 if none
	Op    string // the failed operation ("open", "write", ...)
	Path  string // the path it failed on
	Bytes int64  // bytes written (WriteFile, CopyIn)
	More  bool   // more messages follow (ReadDir batches, CopyOut's first)
}

// FileUp is one client message of a file call: Msg is one of
// *FileUp_Request (first), *FileUp_Data, *FileUp_Eof.
type FileUp struct{ Msg isFileUp_Msg }

type isFileUp_Msg interface{ isFileUp_Msg() }

// FileUp_Request starts the call.
type FileUp_Request struct{ Request *FileRequest }

// FileUp_Data is a chunk of the data (WriteFile: the file; CopyIn: a tar
// stream).
type FileUp_Data struct{ Data []byte }

// FileUp_Eof ends the data.
type FileUp_Eof struct{ Eof bool }

func (*FileUp_Request) isFileUp_Msg() {}
func (*FileUp_Data) isFileUp_Msg()    {}
func (*FileUp_Eof) isFileUp_Msg()     {}

// FileDown is one agent message of a file call: Msg is one of
// *FileDown_Data, *FileDown_Result.
type FileDown struct{ Msg isFileDown_Msg }

type isFileDown_Msg interface{ isFileDown_Msg() }

// FileDown_Data is a chunk of data (ReadFile: the file; CopyOut: a tar
// stream).
type FileDown_Data struct{ Data []byte }

// FileDown_Result is a result.
type FileDown_Result struct{ Result *FileResult }

func (*FileDown_Data) isFileDown_Msg()   {}
func (*FileDown_Result) isFileDown_Msg() {}

// AppendWire appends m in the protobuf wire format.
func (m *FileRequest) AppendWire(b []byte) []byte {
	b = appendString(b, 1, m.Path)
	b = appendInt(b, 2, int64(m.Mode))
	b = appendString(b, 3, m.RenameFrom)
	b = appendString(b, 4, m.RenameTo)
	b = appendBool(b, 5, m.Owners)
	b = appendBool(b, 6, m.SetOwner)
	b = appendInt(b, 7, int64(m.Uid))
	b = appendInt(b, 8, int64(m.Gid))
	return appendBool(b, 9, m.Follow)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *FileRequest) UnmarshalWire(b []byte) error {
	*m = FileRequest{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			m.Path = string(f.p)
		case f.num == 2 && f.isVarint():
			m.Mode = uint32(f.u)
		case f.num == 3 && f.isBytes():
			m.RenameFrom = string(f.p)
		case f.num == 4 && f.isBytes():
			m.RenameTo = string(f.p)
		case f.num == 5 && f.isVarint():
			m.Owners = f.u != 0
		case f.num == 6 && f.isVarint():
			m.SetOwner = f.u != 0
		case f.num == 7 && f.isVarint():
			m.Uid = uint32(f.u)
		case f.num == 8 && f.isVarint():
			m.Gid = uint32(f.u)
		case f.num == 9 && f.isVarint():
			m.Follow = f.u != 0
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *FileInfo) AppendWire(b []byte) []byte {
	b = appendString(b, 1, m.Name)
	b = appendInt(b, 2, m.Size)
	b = appendInt(b, 3, int64(m.Mode))
	b = appendInt(b, 4, m.MtimeNs)
	b = appendInt(b, 5, int64(m.Uid))
	b = appendInt(b, 6, int64(m.Gid))
	return appendString(b, 7, m.Link)
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *FileInfo) UnmarshalWire(b []byte) error {
	*m = FileInfo{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			m.Name = string(f.p)
		case f.num == 2 && f.isVarint():
			m.Size = int64(f.u)
		case f.num == 3 && f.isVarint():
			m.Mode = uint32(f.u)
		case f.num == 4 && f.isVarint():
			m.MtimeNs = int64(f.u)
		case f.num == 5 && f.isVarint():
			m.Uid = uint32(f.u)
		case f.num == 6 && f.isVarint():
			m.Gid = uint32(f.u)
		case f.num == 7 && f.isBytes():
			m.Link = string(f.p)
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *FileResult) AppendWire(b []byte) []byte {
	for _, i := range m.Infos {
		b = appendMessage(b, 1, i)
	}
	b = appendString(b, 2, m.Error)
	b = appendInt(b, 3, int64(m.Errno))
	b = appendString(b, 4, m.Op)
	b = appendString(b, 5, m.Path)
	b = appendInt(b, 6, m.Bytes)
	return appendBool(b, 7, m.More)
}

// MaxInfos bounds the entries one FileResult may carry (the agent sends
// ReadDir in batches of 512): an entry can be encoded in 2 bytes and
// decodes into some 100, so a message of empty entries must not make its
// reader allocate fifty times its size.
const MaxInfos = 4096

// UnmarshalWire replaces m with the message encoded in b. More than
// MaxInfos entries are an error.
func (m *FileResult) UnmarshalWire(b []byte) error {
	*m = FileResult{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			if len(m.Infos) == MaxInfos {
				return fmt.Errorf("agent message: more than %d file entries in one result", MaxInfos)
			}
			i := &FileInfo{}
			m.Infos = append(m.Infos, i)
			return i.UnmarshalWire(f.p)
		case f.num == 2 && f.isBytes():
			m.Error = string(f.p)
		case f.num == 3 && f.isVarint():
			m.Errno = int32(f.u)
		case f.num == 4 && f.isBytes():
			m.Op = string(f.p)
		case f.num == 5 && f.isBytes():
			m.Path = string(f.p)
		case f.num == 6 && f.isVarint():
			m.Bytes = int64(f.u)
		case f.num == 7 && f.isVarint():
			m.More = f.u != 0
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *FileUp) AppendWire(b []byte) []byte {
	switch x := m.Msg.(type) {
	case *FileUp_Request:
		r := x.Request
		if r == nil {
			r = &FileRequest{}
		}
		b = appendMessage(b, 1, r)
	case *FileUp_Data:
		b = appendField(b, 2, protowire.BytesType, 0, x.Data)
	case *FileUp_Eof:
		b = appendField(b, 3, protowire.VarintType, protowire.EncodeBool(x.Eof), nil)
	}
	return b
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *FileUp) UnmarshalWire(b []byte) error {
	*m = FileUp{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			r := &FileRequest{}
			m.Msg = &FileUp_Request{Request: r}
			return r.UnmarshalWire(f.p)
		case f.num == 2 && f.isBytes():
			m.Msg = &FileUp_Data{Data: f.p}
		case f.num == 3 && f.isVarint():
			m.Msg = &FileUp_Eof{Eof: f.u != 0}
		}
		return nil
	})
}

// AppendWire appends m in the protobuf wire format.
func (m *FileDown) AppendWire(b []byte) []byte {
	switch x := m.Msg.(type) {
	case *FileDown_Data:
		b = appendField(b, 1, protowire.BytesType, 0, x.Data)
	case *FileDown_Result:
		r := x.Result
		if r == nil {
			r = &FileResult{}
		}
		b = appendMessage(b, 2, r)
	}
	return b
}

// UnmarshalWire replaces m with the message encoded in b.
func (m *FileDown) UnmarshalWire(b []byte) error {
	*m = FileDown{}
	return eachField(b, func(f field) error {
		switch {
		case f.num == 1 && f.isBytes():
			m.Msg = &FileDown_Data{Data: f.p}
		case f.num == 2 && f.isBytes():
			r := &FileResult{}
			m.Msg = &FileDown_Result{Result: r}
			return r.UnmarshalWire(f.p)
		}
		return nil
	})
}
