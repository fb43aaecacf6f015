package level

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in, bucket, path, err string
	}{
		{"s3://bucket", "bucket", "", ""},
		{"s3://bucket/", "bucket", "", ""},
		{"s3://my.bucket-1/job/7", "my.bucket-1", "job/7", ""},
		{"s3://bucket/job/7/", "bucket", "job/7", ""},
		{"s3://AKIA:secret@bucket/x", "", "", "credentials in it"},
		{"s3://Bucket/x", "", "", "not a bucket name"},
		{"s3://bu/x", "", "", "not a bucket name"},
		{"s3://bucket/a/../b", "", "", "not allowed"},
		{"s3://bucket/a//b", "", "", "not allowed"},
		{"s3://bucket/.gpucr/blobs", "", "", "not allowed"},
		{"s3://bucket/x?versionId=1", "", "", "no query"},
		{"/dev/shm/img", "", "", "not an s3:// URL"},
	} {
		r, err := Parse(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Parse(%q) = %+v, %v; want an error with %q", c.in, r, err, c.err)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("Parse(%q)'s error echoes the secret: %v", c.in, err)
			}
			continue
		}
		if err != nil || r.Bucket != c.bucket || r.Path != c.path {
			t.Errorf("Parse(%q) = %+v, %v; want bucket %q path %q", c.in, r, err, c.bucket, c.path)
		}
	}
}

func TestValidRel(t *testing.T) {
	for p, want := range map[string]bool{
		"gpucr/manifest.pb": true, "pages-1.img": true, "gpucr/chunks/ab/abcdef": true,
		"": false, "/etc/passwd": false, "../x": false, "a/../../x": false, "a//b": false, "./a": false, "a\x00b": false,
	} {
		if got := validRel(p); got != want {
			t.Errorf("validRel(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestOpenEndpoint(t *testing.T) {
	for _, ep := range []string{"ftp://host", "http://user:pw@host:9000", "http://host:9000/path", "host:9000"} {
		if _, err := Open(Options{Endpoint: ep}); err == nil || strings.Contains(err.Error(), "pw") {
			t.Errorf("Open(%q): %v", ep, err)
		}
	}
	if _, err := Open(Options{Endpoint: "http://127.0.0.1:9000"}); err != nil {
		t.Errorf("Open of a plain endpoint: %v", err)
	}
}

// A drain's record follows it from its start to its end; one whose process
// is gone without an end is "died"; only the newest finished ones stay.
func TestDrainRecords(t *testing.T) {
	t.Setenv("GPUCR_DRAIN_DIR", t.TempDir())
	if err := StartRecord(1<<22+7, "/img/a", "s3://b/a"); err != nil { // no such process
		t.Fatal(err)
	}
	r, err := NewRecorder("/img/b", "s3://b/b")
	if err != nil {
		t.Fatal(err)
	}
	r.every = 0
	r.Progress(Progress{Files: 4, FilesDone: 1, Bytes: 400, BytesDone: 100, BytesMoved: 100})
	ds, err := Drains()
	if err != nil || len(ds) != 2 {
		t.Fatalf("Drains = %+v, %v", ds, err)
	}
	for _, d := range ds {
		switch d.URL {
		case "s3://b/a":
			if d.State != "died" {
				t.Errorf("a drain whose process is gone: %+v", d)
			}
		case "s3://b/b":
			// this test's own process runs, but is no push
			if d.State != "died" || d.FilesDone != 1 || d.BytesDone != 100 {
				t.Errorf("the recorded drain: %+v", d)
			}
		}
	}
	if err := r.End(errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	for _, d := range mustDrains(t) {
		if d.URL == "s3://b/b" && (d.State != "failed" || d.Error != "boom" || d.Finished.IsZero()) {
			t.Errorf("a failed drain: %+v", d)
		}
	}
	for i := 0; i < keepFinished+5; i++ {
		if err := StartRecord(1<<22+100+i, "/img", "s3://b/old"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(mustDrains(t)); n != keepFinished {
		t.Errorf("%d drains kept, want the newest %d", n, keepFinished)
	}
}

func mustDrains(t *testing.T) []Drain {
	t.Helper()
	ds, err := Drains()
	if err != nil {
		t.Fatal(err)
	}
	return ds
}
