package level

import (
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
