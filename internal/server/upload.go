package server

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"time"
)

// uploadBody is a request body handed to an upload (Box.CopyInTar,
// Box.WriteFileFrom). Those return as soon as the box fails the call,
// possibly while a Read of the body is still pending (a client that sends
// slowly, or has stopped). A handler must not return while the body is
// being read, and net/http, before it writes the response, reads what is
// left of a small body (which a stalled client never sends). end stops
// further Reads and, unless the body was read to its end, cuts it
// through the connection's read deadline and waits for a pending Read.
type uploadBody struct {
	r  io.Reader
	rc *http.ResponseController

	mu      sync.Mutex
	ended   bool
	reading bool          // a Read is pending (the upload reads from one goroutine)
	eof     bool          // the body was read to its end
	idle    chan struct{} // closed when the Read pending at end returns
}

// errUploadEnded is what Reads of an ended upload body return.
var errUploadEnded = errors.New("the upload has ended")

// uploadEndWait bounds how long end waits for an interrupted Read.
const uploadEndWait = 5 * time.Second

func newUploadBody(w http.ResponseWriter, r *http.Request) *uploadBody {
	return &uploadBody{r: r.Body, rc: http.NewResponseController(w)}
}

func (u *uploadBody) Read(p []byte) (int, error) {
	u.mu.Lock()
	if u.ended {
		u.mu.Unlock()
		return 0, errUploadEnded
	}
	u.reading = true
	u.mu.Unlock()
	n, err := u.r.Read(p)
	u.mu.Lock()
	u.reading = false
	u.eof = u.eof || err == io.EOF
	if u.idle != nil {
		close(u.idle)
		u.idle = nil
	}
	u.mu.Unlock()
	return n, err
}

// end is called once the upload call has returned, before the response
// is sent: it stops further Reads and, unless the body was read to its
// end (the client's upload outlived the call), lets a client that is
// still sending finish (up to uploadDrainMax more bytes within
// uploadDrainWait: it then reads the answer instead of a reset
// connection), else cuts the body's reads through the connection's read
// deadline, so that neither a pending Read nor net/http's own read of the
// rest waits for a stalled client (the connection is then not reused). A
// pending Read that does not end in uploadEndWait aborts the connection.
func (u *uploadBody) end() {
	u.mu.Lock()
	u.ended = true
	if u.eof {
		u.mu.Unlock()
		return
	}
	var idle chan struct{}
	if u.reading {
		idle = make(chan struct{})
		u.idle = idle
	}
	u.mu.Unlock()
	u.rc.SetReadDeadline(time.Now().Add(uploadDrainWait))
	if idle != nil {
		select {
		case <-idle:
		case <-time.After(uploadEndWait):
			abort()
		}
	}
	// No Read is pending now and none starts (ended): drain here.
	if _, err := io.CopyN(io.Discard, u.r, uploadDrainMax); err == io.EOF {
		u.rc.SetReadDeadline(time.Time{})
		return
	}
	u.rc.SetReadDeadline(time.Now())
}

// uploadDrainMax and uploadDrainWait bound what end reads of a body the
// upload did not need: a client still sending a small rest gets the
// answer; a stalled or large one gets a cut connection.
const (
	uploadDrainMax  = 8 << 20
	uploadDrainWait = time.Second
)
