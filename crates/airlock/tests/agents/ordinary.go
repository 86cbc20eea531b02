// An ordinary Go agent (a static binary): goroutines, files, a
// subprocess, and an HTTP request through the run's proxy (to the test's
// server named in the prompt).
package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

func main() {
	r := map[string]interface{}{}
	prompt, err := os.ReadFile(os.Getenv("AIRLOCK_PROMPT_FILE"))
	check(err)
	target := strings.TrimSpace(string(prompt))

	var wg sync.WaitGroup
	sums := make([]string, 16)
	for i := range sums {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			h := sha256.Sum256([]byte(strings.Repeat(fmt.Sprint(i), 100000)))
			sums[i] = fmt.Sprintf("%x", h[:4])
		}(i)
	}
	wg.Wait()
	r["threads"] = len(sums)

	ws := os.Getenv("AIRLOCK_WORKSPACE")
	if ws == "" {
		ws = "/workspace"
	}
	file := filepath.Join(ws, "out.txt")
	check(os.WriteFile(file, []byte("written"), 0o600))
	back, err := os.ReadFile(file)
	check(err)
	r["workspace_file"] = string(back)
	tmp, err := os.CreateTemp("", "agent-")
	check(err)
	_, err = tmp.Write(make([]byte, 100000))
	check(err)
	st, err := tmp.Stat()
	check(err)
	r["tmp_file"] = st.Size()

	out, err := exec.Command("/bin/sh", "-c", "echo $((6 * 7))").Output()
	check(err)
	r["subprocess"] = strings.TrimSpace(string(out))

	proxy, err := url.Parse(os.Getenv("HTTP_PROXY"))
	check(err)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
	resp, err := client.Get("http://" + target + "/hello")
	check(err)
	body, err := io.ReadAll(resp.Body)
	check(err)
	r["http"] = []interface{}{resp.StatusCode, string(body)}

	doc, err := json.Marshal(r)
	check(err)
	check(os.WriteFile(os.Getenv("AIRLOCK_RESULT_FILE"), doc, 0o600))
	fmt.Println("RESULT " + string(doc))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
