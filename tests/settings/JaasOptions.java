import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Map;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.common.security.JaasContext;

/** Each argument parsed as a sasl.jaas.config by Kafka's client; prints "n option hex(value)". */
public class JaasOptions {
    public static void main(String[] args) {
        for (int n = 0; n < args.length; n++) {
            JaasContext context = JaasContext.loadClientContext(Map.of("sasl.jaas.config", new Password(args[n])));
            for (AppConfigurationEntry entry : context.configurationEntries()) {
                for (Map.Entry<String, ?> option : entry.getOptions().entrySet()) {
                    byte[] value = option.getValue().toString().getBytes(StandardCharsets.UTF_8);
                    System.out.println(n + " " + option.getKey() + " " + HexFormat.of().formatHex(value));
                }
            }
        }
    }
}
