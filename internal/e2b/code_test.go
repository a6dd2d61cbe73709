package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/codebox"
)

// TestResultDataAndChart checks the result lines E2B's SDK reads a
// DataFrame's data and a figure's chart from: "data" and "chart" as JSON
// objects, beside the PNG for a figure; JSON that is not valid goes to
// "extra" rather than breaking the line.
func TestResultDataAndChart(t *testing.T) {
	r := resultOf(map[string]string{"text/plain": "df", codebox.MIMEData: `{"a": [1, null]}`, codebox.MIMEChart: `{"type": "bar"`}, true)
	b, _ := json.Marshal(r)
	const want = `{"data":{"a":[1,null]},"extra":{"e2b/chart":"{\"type\": \"bar\""},"is_main_result":true,"text":"df","type":"result"}`
	if string(b) != want {
		t.Errorf("resultOf: %s\nwant %s", b, want)
	}
	rec := httptest.NewRecorder()
	o := &cellStream{w: rec, rc: http.NewResponseController(rec), cancel: func() {}}
	o.image(codebox.Image{MIMEType: "image/png", Data: []byte("\x89PNG"), Chart: json.RawMessage(`{"type":"line","elements":[]}`)})
	var line map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(rec.Body.String())), &line); err != nil {
		t.Fatalf("%q: %v", rec.Body.String(), err)
	}
	if c, ok := line["chart"].(map[string]any); !ok || c["type"] != "line" || line["png"] != "iVBORw==" {
		t.Errorf("a figure's line: %v, want its png and chart", line)
	}
}
