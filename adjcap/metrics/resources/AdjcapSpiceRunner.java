/*
 * adjcap: a small launcher for SPICE 1.0 (spice-1.0.jar, shipped by pycocoevalcap).
 *
 * SPICE's own main (edu.anu.spice.SpiceScorer) pretty-prints its JSON output through the
 * javax.script JavaScript engine, which Java 15+ no longer ships, so `-out` fails there with a
 * NullPointerException. This class runs the same batch scorer (same arguments, same parsing and
 * scoring) and writes the scorer's own JSON (SpiceStats.toJSONString) directly.
 * It lives in SPICE's package only to reach the package-private SpiceArguments constructor.
 */
package edu.anu.spice;

import java.io.FileOutputStream;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

public final class AdjcapSpiceRunner {
    private AdjcapSpiceRunner() {}

    public static void main(String[] argv) throws Exception {
        String out = null;
        List<String> rest = new ArrayList<>();
        for (int i = 0; i < argv.length; i++) {
            if (argv[i].equals("-out") && i + 1 < argv.length) {
                out = argv[++i];
            } else {
                rest.add(argv[i]);
            }
        }
        if (out == null || rest.isEmpty()) {
            System.err.println("usage: AdjcapSpiceRunner <input.json> -out <out.json> [SPICE options]");
            System.exit(2);
        }
        if (!rest.contains("-silent")) {
            rest.add("-silent");
        }
        SpiceArguments args = new SpiceArguments(rest.toArray(new String[0]));
        SpiceScorer scorer = new SpiceScorer();
        try {
            scorer.scoreBatch(args);
        } catch (Exception ex) {
            System.err.println("Error: Could not score batched file input:");
            ex.printStackTrace();
            System.exit(1);
        }
        if (scorer.stats == null) {
            System.err.println("Error: SPICE produced no statistics");
            System.exit(1);
        }
        try (Writer w = new OutputStreamWriter(new FileOutputStream(out), StandardCharsets.UTF_8)) {
            w.write(scorer.stats.toJSONString());
        }
    }
}
